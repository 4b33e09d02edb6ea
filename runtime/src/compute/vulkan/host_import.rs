//! Host memory imported into the device (`VK_EXT_external_memory_host`): the ring's slots.
//!
//! The loaders read records into plain, page-aligned host memory, which is what `O_DIRECT` and
//! io_uring's registered buffers need, and the device imports that same memory as a
//! `VkDeviceMemory` with a transfer-source buffer over it. A slot's bytes carry the import's
//! id ([`crate::base::SlotBytes`]); an upload of them is one `vkCmdCopyBuffer` from
//! the slot to the tensor, recorded ahead of the step in the same submission
//! ([`super::exec::VulkanExec::run_reading`]): the GPU reads the batch where the disk put it
//! and the CPU copies nothing. On a unified-memory board those pages are the GPU's own memory,
//! so nothing crosses a bus either.
//!
//! Why import host memory rather than map device memory for the ring: mapped device memory is
//! often not ordinary pages (a `VM_PFNMAP` mapping), and `O_DIRECT` reads into it and io_uring
//! buffer registration fail there.
//!
//! Why a copy on the device rather than binding the slot as the step's input: binding would
//! need the step recorded once per slot (and again whenever the loader restarts with a new
//! ring), while the copy takes microseconds of device bandwidth. The slot is held until the
//! step's fence (one slot of the ring's prefetch), the price of one submission per step.
//!
//! Lifetimes: the Vulkan objects go before the host pages (see [`ImportedHostMemory`]'s
//! `Drop`), and each live import is listed in the device's `import_registry::HostImport` by
//! its id so that an upload can find it. Dropping an import takes the same lock an upload
//! holds until its copy has finished, so an import cannot go away while the GPU reads from it.

use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;

use super::device::Device;
use super::{Error, Result};
use crate::base::{HostMemory, ImportId, SlotAllocator, SlotError, SlotMemory};

const HANDLE: vk::ExternalMemoryHandleTypeFlags =
    vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;

/// Zeroed host memory the device has imported: see the module docs. It backs ring slots
/// ([`SlotMemory`]); uploads of bytes inside it are copies on the GPU.
pub struct ImportedHostMemory {
    id: ImportId,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    device: Arc<Device>,
    /// Freed after `Drop::drop` has destroyed the Vulkan objects over it (field drop order).
    host: HostMemory,
}

impl ImportedHostMemory {
    /// Allocates at least `bytes` of zeroed host memory and imports it into `device`.
    pub(crate) fn new(device: &Arc<Device>, bytes: usize) -> Result<ImportedHostMemory> {
        let what = |detail: String| Error::Buffer {
            name: "ring slots (imported host memory)".to_owned(),
            detail,
        };
        let import = device.host_import.as_ref().ok_or_else(|| {
            what("the device does not have VK_EXT_external_memory_host".to_owned())
        })?;
        let host =
            HostMemory::zeroed_aligned(bytes, import.alignment() as usize).ok_or_else(|| {
                what(format!(
                    "could not allocate {bytes} bytes aligned to {}",
                    import.alignment()
                ))
            })?;
        let pointer = host.base().as_ptr().cast::<std::ffi::c_void>();
        let mut pointer_props = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: the extension is enabled on this device (HostImport exists only then); the
        // pointer is to live host memory aligned to minImportedHostPointerAlignment; the
        // output struct lives across the call.
        unsafe {
            (import.fns().fp().get_memory_host_pointer_properties_ext)(
                device.raw.handle(),
                HANDLE,
                pointer,
                &mut pointer_props,
            )
        }
        .result()
        .map_err(Error::vk("vkGetMemoryHostPointerPropertiesEXT"))?;

        let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(HANDLE);
        let info = vk::BufferCreateInfo::default()
            .size(host.len() as u64)
            .usage(vk::BufferUsageFlags::TRANSFER_SRC)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut external);
        // SAFETY: a valid device and create info (non-zero size; the external-memory struct
        // names a handle type of an enabled extension).
        let buffer = unsafe { device.raw.create_buffer(&info, None) }
            .map_err(Error::vk("vkCreateBuffer"))?;
        let mut made = ImportedHostMemory {
            id: import.next_id(),
            buffer,
            memory: vk::DeviceMemory::null(),
            device: Arc::clone(device),
            host,
        };
        // SAFETY: `buffer` was just created from this device.
        let requirements = unsafe { device.raw.get_buffer_memory_requirements(buffer) };
        if requirements.size > made.host.len() as u64 {
            return Err(what(format!(
                "the buffer over it needs {} bytes, more than the {} imported",
                requirements.size,
                made.host.len()
            )));
        }
        // Host-coherent only: the loaders' writes are then visible to the copy at submission,
        // with no flush. (A device without one, such as a SoC without I/O coherency, refuses
        // here; the loader then keeps the ring in plain host memory and says why.)
        let type_index = (0..device.memory_types.len() as u32)
            .find(|&i| {
                (requirements.memory_type_bits & pointer_props.memory_type_bits) & (1 << i) != 0
                    && device.memory_types[i as usize]
                        .contains(vk::MemoryPropertyFlags::HOST_COHERENT)
            })
            .ok_or_else(|| {
                what(format!(
                    "no host-coherent memory type accepts it (memory types {:#b} for the \
                     pointer, {:#b} for the buffer)",
                    pointer_props.memory_type_bits, requirements.memory_type_bits
                ))
            })?;
        let mut import_info = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(HANDLE)
            .host_pointer(pointer);
        let allocate = vk::MemoryAllocateInfo::default()
            .allocation_size(made.host.len() as u64)
            .memory_type_index(type_index)
            .push_next(&mut import_info);
        // SAFETY: the pointer and size are aligned to minImportedHostPointerAlignment, the
        // memory type is one the pointer's properties allow, and the host memory outlives the
        // device memory (it is freed after `Drop::drop` frees this).
        made.memory = unsafe { device.raw.allocate_memory(&allocate, None) }
            .map_err(Error::vk("vkAllocateMemory (host pointer import)"))?;
        // SAFETY: the memory is of a type the buffer accepts and at least its size; bound once.
        unsafe { device.raw.bind_buffer_memory(buffer, made.memory, 0) }
            .map_err(Error::vk("vkBindBufferMemory"))?;
        import.add(made.id, made.host.len() as u64, buffer);
        Ok(made)
    }
}

impl Drop for ImportedHostMemory {
    fn drop(&mut self) {
        if let Some(import) = &self.device.host_import {
            // Waits for an upload copying from this memory to finish.
            import.remove(self.buffer);
        }
        // SAFETY: made from this device; no GPU work uses them (every submission is waited for,
        // and an upload from here holds the lock taken above); null handles are ignored.
        unsafe {
            self.device.raw.destroy_buffer(self.buffer, None);
            self.device.raw.free_memory(self.memory, None);
        }
    }
}

// SAFETY: `HostMemory` gives a zeroed block aligned to at least a page, `len()` long, that
// lives (and does not move) until `self` drops.
unsafe impl SlotMemory for ImportedHostMemory {
    fn base(&self) -> NonNull<u8> {
        self.host.base()
    }
    fn len(&self) -> usize {
        self.host.len()
    }
    fn kind(&self) -> &'static str {
        IMPORTED_KIND
    }
    fn import_id(&self) -> Option<ImportId> {
        Some(self.id)
    }
}

/// [`SlotMemory::kind`] of imported ring slots.
pub const IMPORTED_KIND: &str = "host, imported into Vulkan (the GPU copies each batch)";

/// Hands out [`ImportedHostMemory`] for the loader's ring ([`crate::base::SlotAllocator`]).
#[derive(Clone)]
pub struct HostImporter {
    device: Arc<Device>,
}

impl HostImporter {
    /// An importer for `device`, if the device can import host memory.
    pub(crate) fn new(device: &Arc<Device>) -> Option<HostImporter> {
        device.host_import.as_ref().map(|_| HostImporter {
            device: Arc::clone(device),
        })
    }
}

impl std::fmt::Debug for HostImporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostImporter")
            .field("device", &self.device.info.label())
            .finish()
    }
}

impl SlotAllocator for HostImporter {
    fn allocate(&self, bytes: usize) -> std::result::Result<Box<dyn SlotMemory>, SlotError> {
        ImportedHostMemory::new(&self.device, bytes)
            .map(|m| Box::new(m) as Box<dyn SlotMemory>)
            .map_err(|e| Box::new(e) as SlotError)
    }
}
