//! Named storage buffers and their memory from `gpu-allocator`; each is listed in the
//! device's [`super::AllocationReport`] while it lives ([`super::allocation`]).
//!
//! A [`Buffer`] owns its `VkBuffer` and its allocation and holds the device (`Arc`), so the
//! device outlives it; its `Drop` destroys the buffer, then frees the allocation, then takes
//! it off the report. Every buffer can be a storage buffer and a transfer source and
//! destination; where the device has a separate transfer queue, buffers are shared between
//! the two families (`VK_SHARING_MODE_CONCURRENT`), so no ownership transfer is ever needed.
//!
//! Host access ([`Buffer::write`], [`Buffer::read`], [`Buffer::mapped_mut`]) takes `&mut
//! self`: a run borrows its buffers for the whole call, so the host can never touch memory
//! the GPU is using. Host-visible memory from `gpu-allocator` is always host-coherent: no
//! flush or invalidate is needed.

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};

use super::allocation::{BufferRecord, Location};
use super::device::Device;
use super::{Error, Result};

/// A storage buffer with a name, its memory and its place in the allocation report.
pub struct Buffer {
    raw: vk::Buffer,
    /// Taken out and freed in `Drop` (after the buffer is destroyed).
    allocation: ManuallyDrop<Allocation>,
    name: String,
    size: u64,
    location: Location,
    id: u64,
    pub(crate) device: Arc<Device>,
}

impl Buffer {
    pub(crate) fn new(
        device: &Arc<Device>,
        name: &str,
        size: u64,
        location: Location,
    ) -> Result<Buffer> {
        if size == 0 {
            return Err(Error::Buffer {
                name: name.to_owned(),
                detail: "a buffer needs at least one byte".to_owned(),
            });
        }
        let families = device.families();
        let mut info = vk::BufferCreateInfo::default().size(size).usage(
            vk::BufferUsageFlags::STORAGE_BUFFER
                | vk::BufferUsageFlags::UNIFORM_TEXEL_BUFFER
                | vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST,
        );
        info = if families.len() > 1 {
            info.sharing_mode(vk::SharingMode::CONCURRENT)
                .queue_family_indices(&families)
        } else {
            info.sharing_mode(vk::SharingMode::EXCLUSIVE)
        };
        // SAFETY: a valid device and create info (size > 0, distinct families).
        let raw = unsafe { device.raw.create_buffer(&info, None) }
            .map_err(Error::vk("vkCreateBuffer"))?;
        // SAFETY: `raw` was just created from this device.
        let requirements = unsafe { device.raw.get_buffer_memory_requirements(raw) };
        let allocation = device.allocator().allocate(&AllocationCreateDesc {
            name,
            requirements,
            location: location.memory_location(),
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        });
        let allocation = match allocation {
            Ok(a) => a,
            Err(source) => {
                // SAFETY: `raw` is unused and unbound.
                unsafe { device.raw.destroy_buffer(raw, None) };
                return Err(Error::Alloc {
                    name: name.to_owned(),
                    bytes: size,
                    location,
                    source,
                });
            }
        };
        // SAFETY: the allocation satisfies `requirements` of `raw` (gpu-allocator honours
        // size, alignment and memory type bits); the buffer is bound once.
        let bound = unsafe {
            device
                .raw
                .bind_buffer_memory(raw, allocation.memory(), allocation.offset())
        };
        if let Err(result) = bound {
            // SAFETY: `raw` is unused; the allocation goes back to the allocator.
            unsafe { device.raw.destroy_buffer(raw, None) };
            let _ = device.allocator().free(allocation);
            return Err(Error::Vk {
                what: "vkBindBufferMemory",
                result,
            });
        }
        let flags = allocation.memory_properties();
        let record = BufferRecord {
            name: name.to_owned(),
            bytes: size,
            allocated: allocation.size(),
            location,
            device_local: flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL),
            host_visible: flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE),
        };
        let id = device.registry().add(record);
        Ok(Buffer {
            raw,
            allocation: ManuallyDrop::new(allocation),
            name: name.to_owned(),
            size,
            location,
            id,
            device: Arc::clone(device),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Size in bytes (as asked for; the allocation may be larger).
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn location(&self) -> Location {
        self.location
    }

    /// The host can read and write it directly (mapped, coherent).
    pub fn is_host_visible(&self) -> bool {
        self.allocation.mapped_ptr().is_some()
    }

    /// Its memory is device-local (with [`Buffer::is_host_visible`]: zero-copy memory).
    pub fn is_device_local(&self) -> bool {
        self.allocation
            .memory_properties()
            .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
    }

    pub(crate) fn raw(&self) -> vk::Buffer {
        self.raw
    }

    /// The mapped bytes of a host-visible buffer (exactly [`Buffer::size`] long); `None` for
    /// [`Location::GpuOnly`] memory that is not host-visible. For ring slots this is where the
    /// disk writes (page-aligned pointers have been seen with io_uring fixed buffers).
    pub fn mapped_mut(&mut self) -> Option<&mut [u8]> {
        let size = self.size as usize;
        self.allocation.mapped_slice_mut().map(|s| {
            let len = size.min(s.len());
            &mut s[..len]
        })
    }

    /// Copies `data` into a host-visible buffer at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let range = self.range(offset, data.len())?;
        match self.mapped_mut() {
            Some(mapped) => {
                mapped[range].copy_from_slice(data);
                Ok(())
            }
            None => Err(not_mapped(&self.name)),
        }
    }

    /// Copies from a host-visible buffer at `offset` into `out`.
    pub fn read(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        let range = self.range(offset, out.len())?;
        match self.mapped_mut() {
            Some(mapped) => {
                out.copy_from_slice(&mapped[range]);
                Ok(())
            }
            None => Err(not_mapped(&self.name)),
        }
    }

    /// Writes `f32`s (little-endian, as the GPU reads them) at element `first`.
    pub fn write_f32(&mut self, first: usize, values: &[f32]) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(first as u64 * 4, &bytes)
    }

    /// Reads `out.len()` `f32`s starting at element `first`.
    pub fn read_f32(&mut self, first: usize, out: &mut [f32]) -> Result<()> {
        let mut bytes = vec![0u8; out.len() * 4];
        self.read(first as u64 * 4, &mut bytes)?;
        for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }

    /// `offset..offset + len` as a checked range inside the buffer.
    pub(crate) fn range(&self, offset: u64, len: usize) -> Result<std::ops::Range<usize>> {
        let end = offset.checked_add(len as u64).filter(|&e| e <= self.size);
        match end {
            Some(end) => Ok(offset as usize..end as usize),
            None => Err(Error::Buffer {
                name: self.name.clone(),
                detail: format!(
                    "{len} bytes at offset {offset} do not fit in its {} bytes",
                    self.size
                ),
            }),
        }
    }

    pub(crate) fn same_device(&self, device: &Arc<Device>) -> bool {
        Arc::ptr_eq(&self.device, device)
    }
}

fn not_mapped(name: &str) -> Error {
    Error::Buffer {
        name: name.to_owned(),
        detail: "not host-visible (gpu-only memory): use Engine::upload / Engine::download"
            .to_owned(),
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("name", &self.name)
            .field("size", &self.size)
            .field("location", &self.location)
            .finish()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: no GPU work uses the buffer (every submission is waited for before the call
        // that made it returns, and runs borrow their buffers); the buffer is destroyed once,
        // before its memory is freed; the allocation is taken out exactly once and not used
        // after. The device is alive: this buffer holds an Arc to it.
        unsafe {
            self.device.raw.destroy_buffer(self.raw, None);
            let allocation = ManuallyDrop::take(&mut self.allocation);
            if let Err(e) = self.device.allocator().free(allocation) {
                log::warn!("Vulkan: freeing buffer {:?}: {e}", self.name);
            }
        }
        self.device.registry().remove(self.id);
    }
}
