//! The Vulkan engine's foundation: instance and device selection, buffers through
//! `gpu-allocator`, compute pipelines from the embedded SPIR-V, a persisted `VkPipelineCache`,
//! and a dispatch path that records dispatches into one command buffer, submits, waits and
//! reads timestamps.
//!
//! - [`context`]: the loader (loaded at run time: no Vulkan at build time, and a machine with
//!   no loader gets [`Error::NoLoader`], not a failed start), the instance (with the Khronos
//!   validation layer and a [`ValidationLog`] when asked), every device described as a plain
//!   [`DeviceInfo`], the choice of device ([`pick_device`]: discrete > integrated > virtual >
//!   CPU, or an explicit index).
//! - `device`: the logical device with its compute queue (plus a transfer queue where the
//!   device has a transfer-only family), its allocator, and the lists of what lives on it:
//!   its buffers ([`allocation`]) and its host-memory imports (`import_registry`).
//! - [`buffer`]: named buffers; every live one is listed in the [`AllocationReport`].
//! - [`kernels`]: the table of kernels (one GLSL file a kernel in `shaders/`, embedded SPIR-V).
//! - [`pipeline`]: a kernel's compute pipeline, specialised by [`SpecConstant`]s.
//! - [`cache`]: the `VkPipelineCache` persisted under the user's cache directory, checked
//!   against device, driver and shaders, and ignored (never a crash) when stale or corrupt.
//! - [`engine`]: [`Engine`] ties them together: `buffer`, `pipeline`, `run`, `upload`,
//!   `download`.
//! - [`lower`]: a [`crate::compute::Recording`]'s steps as dispatches (kernel, grid,
//!   bindings, push constants), as plain data, with the device's kernel variants
//!   ([`lower::Variants`]: fp16, or direct kernels without barriers on CPU-type devices).
//! - [`barriers`]: which dispatches need a barrier before them (an access after a
//!   conflicting one), from the buffers they bind and what their SPIR-V writes.
//! - [`host_import`]: host memory imported into the device (`VK_EXT_external_memory_host`)
//!   for the loader's ring: uploads from it are GPU copies, with no CPU copy.
//! - [`exec`]: [`VulkanExec`], a recording on the engine: its buffers (sized against the
//!   memory budget first), pipelines and one recorded command buffer per entry, replayed.
//! - [`probe`]: device listing in a child process, so that choosing the CPU engine leaves
//!   no Vulkan driver mapped in this one.
//! - [`frames`]: the frame pass on the GPU, a dispatch submitted ahead of an entry that
//!   writes the letterboxed record from a camera frame.
//!
//! # Ownership: why nothing can be freed in the wrong order
//!
//! The logical device, its allocator and the instance live in one private `Device`, shared as
//! `Arc<Device>`. Every object made from it — [`Buffer`], [`Pipeline`], the pipeline cache, the
//! engine's command pool — holds a clone of that `Arc` and destroys its own Vulkan objects (and
//! frees its allocation) in its `Drop`. The device is destroyed only when the last `Arc` goes,
//! so after every object made from it; and `Device`'s `Drop` drops the allocator (which frees
//! its memory blocks) before `vkDestroyDevice`, then the debug messenger, the instance and
//! finally the loader library, in that order. No drop order of user values can break this.
//!
//! No GPU work outlives a call: [`Engine::run`], [`Engine::upload`] and [`Engine::download`]
//! wait for their fence before they return, and the buffers a run uses are borrowed for the
//! call, so no buffer can be dropped or written by the host while the GPU uses it.
//!
//! # Environment
//!
//! - `FULCRUM_VULKAN_VALIDATION=1`: enable the validation layer (as [`Options::validation`]),
//!   with its synchronization validation where the layer offers it.
//! - `FULCRUM_VULKAN_LOADER=/path/libvulkan.so.1`: the loader library to use instead of the
//!   system's `libvulkan.so.1`, for boards with the loader in an unusual place (and tests of
//!   the no-loader path).
//! - `XDG_CACHE_HOME` / `HOME`: where the pipeline cache lives (see [`cache`]).
//! - The loader's own variables (`VK_ICD_FILENAMES`, `VK_DRIVER_FILES`, …) work as usual.
//!
//! # Unsafe code
//!
//! Vulkan calls are `unsafe`; they stay in this module. Every `unsafe` block says why it is
//! sound in a `// SAFETY:` comment. The public API is safe: it checks what Vulkan would
//! otherwise leave undefined (buffer counts and push-constant sizes against the kernel,
//! objects from another device, grid limits, workgroup sizes).

pub mod allocation;
pub mod barriers;
pub mod buffer;
pub mod cache;
pub mod context;
pub(crate) mod device;
pub mod engine;
pub mod exec;
pub mod frames;
pub mod host_import;
pub(crate) mod import_registry;
#[cfg(test)]
mod kernel_tests;
pub mod kernels;
pub mod lower;
pub mod options;
pub mod pipeline;
pub mod probe;
pub mod program;
#[doc(hidden)]
pub mod testing;

use ash::vk;

pub use allocation::{AllocationReport, BufferRecord, Location};
pub use buffer::Buffer;
pub use cache::{CacheLoad, CacheStatus};
pub use context::{
    list_devices, pick_device, DeviceInfo, DeviceList, DeviceType, Limits, MemoryHeapInfo,
    QueueFamilyInfo, ValidationLog,
};
pub use engine::{Dispatch, Engine, Timestamps, Timing};
pub use exec::VulkanExec;
pub use frames::{FrameJob, FrameTiming};
pub use host_import::{HostImporter, ImportedHostMemory, IMPORTED_KIND};
pub use kernels::{Kernel, KernelInfo, MAX_INVOCATIONS, MAX_SHARED_BYTES};
pub use options::{default_cache_dir, CacheDir, Options, LOADER_ENV, VALIDATION_ENV};
pub use pipeline::{Pipeline, SpecConstant};
pub use program::{Program, ProgramDispatch};

/// What went wrong in the Vulkan engine. [`Error::is_unavailable`] tells "this machine has no
/// usable Vulkan" (use the CPU engine) from real failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no Vulkan loader ({path}): {detail}; install it (Debian: apt install libvulkan1 \
         mesa-vulkan-drivers) or point {LOADER_ENV} at it"
    )]
    NoLoader { path: String, detail: String },
    #[error("the Vulkan loader supports Vulkan {version}; fulcrum needs 1.1 or newer")]
    LoaderTooOld { version: String },
    #[error(
        "no Vulkan device: the loader found no driver (for a CPU device: apt install \
         mesa-vulkan-drivers)"
    )]
    NoDevice,
    #[error("no usable Vulkan device: {detail}")]
    NoUsableDevice { detail: String },
    #[error("there is no Vulkan device {index}; the devices are: {list}")]
    DeviceIndex { index: usize, list: String },
    #[error("Vulkan device {index} ({name}) cannot run fulcrum: {reason}")]
    DeviceUnusable {
        index: usize,
        name: String,
        reason: String,
    },
    #[error(
        "the Khronos validation layer was asked for ({VALIDATION_ENV} or the validation option) \
         but {what} is not installed (Debian: apt install vulkan-validationlayers)"
    )]
    ValidationUnavailable { what: &'static str },
    #[error("{name} = {value}: use {expected}")]
    BadOption {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("{name}={value:?}: use {expected}, or unset it")]
    BadEnv {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("Vulkan: {what} failed: {result}")]
    Vk {
        what: &'static str,
        result: vk::Result,
    },
    #[error(transparent)]
    Access(#[from] crate::compute::recording::AccessError),
    #[error("Vulkan: creating the memory allocator: {0}")]
    Allocator(gpu_allocator::AllocationError),
    #[error("buffer {name:?} ({bytes} bytes, {location}): allocation failed: {source}")]
    Alloc {
        name: String,
        bytes: u64,
        location: Location,
        source: gpu_allocator::AllocationError,
    },
    #[error("buffer {name:?}: {detail}")]
    Buffer { name: String, detail: String },
    #[error("kernel {kernel}: {detail}")]
    Pipeline {
        kernel: &'static str,
        detail: String,
    },
    #[error("dispatch {index} ({kernel}): {detail}")]
    Dispatch {
        index: usize,
        kernel: &'static str,
        detail: String,
    },
    #[error("GPU work did not finish within {seconds} s (hung device or driver?)")]
    Timeout { seconds: u64 },
    #[error("pipeline cache {path}: {source}")]
    CacheIo {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl Error {
    /// Whether the error means "no usable Vulkan here" (no loader, no device, no device that
    /// can run fulcrum): the caller should log it and use the CPU engine.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Error::NoLoader { .. }
                | Error::LoaderTooOld { .. }
                | Error::NoDevice
                | Error::NoUsableDevice { .. }
        )
    }

    /// An `Error::Vk` for `what`, for `map_err`.
    pub(crate) fn vk(what: &'static str) -> impl FnOnce(vk::Result) -> Error {
        move |result| Error::Vk { what, result }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `major.minor.patch` of a packed Vulkan version.
pub fn version_string(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}
