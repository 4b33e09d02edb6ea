//! Where buffers' memory lives ([`Location`]) and the bookkeeping of a device's live buffers
//! (`Registry`, kept by the device): what the [`AllocationReport`] prints.

use std::fmt;

use gpu_allocator::MemoryLocation;
use serde::Serialize;

/// Where a buffer's memory lives (`gpu-allocator`'s memory locations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Location {
    /// Written by the CPU, read by the GPU: ring slots, uploads. Host-visible; device-local
    /// too where the device has such memory (unified-memory boards: zero-copy).
    CpuToGpu,
    /// The GPU's own memory (activations, weights); the host reaches it through a staging
    /// copy ([`super::Engine::upload`], [`super::Engine::download`]).
    GpuOnly,
    /// Written by the GPU, read by the CPU: results. Host-visible (cached where possible).
    GpuToCpu,
}

impl Location {
    pub(super) fn memory_location(self) -> MemoryLocation {
        match self {
            Location::CpuToGpu => MemoryLocation::CpuToGpu,
            Location::GpuOnly => MemoryLocation::GpuOnly,
            Location::GpuToCpu => MemoryLocation::GpuToCpu,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Location::CpuToGpu => "cpu-to-gpu",
            Location::GpuOnly => "gpu-only",
            Location::GpuToCpu => "gpu-to-cpu",
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One buffer in the [`AllocationReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BufferRecord {
    pub name: String,
    /// Bytes asked for.
    pub bytes: u64,
    /// Bytes the allocation took (size rounded up to the memory's alignment).
    pub allocated: u64,
    pub location: Location,
    pub device_local: bool,
    pub host_visible: bool,
}

/// The live buffers of a device, in creation order (kept by the device, updated by
/// [`super::Buffer::new`] and its `Drop`).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next_id: u64,
    live: Vec<(u64, BufferRecord)>,
    peak_bytes: u64,
}

impl Registry {
    pub(super) fn add(&mut self, record: BufferRecord) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.live.push((id, record));
        self.peak_bytes = self.peak_bytes.max(self.total());
        id
    }

    pub(super) fn remove(&mut self, id: u64) {
        self.live.retain(|(i, _)| *i != id);
    }

    fn total(&self) -> u64 {
        self.live.iter().map(|(_, r)| r.allocated).sum()
    }

    pub(crate) fn report(&self, device_memory_bytes: u64) -> AllocationReport {
        AllocationReport {
            buffers: self.live.iter().map(|(_, r)| r.clone()).collect(),
            total_bytes: self.total(),
            peak_bytes: self.peak_bytes,
            device_memory_bytes,
        }
    }
}

/// Every live buffer by name, with totals. `Display` prints a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AllocationReport {
    pub buffers: Vec<BufferRecord>,
    /// Sum of the live buffers' allocations.
    pub total_bytes: u64,
    /// The largest `total_bytes` seen since the engine started.
    pub peak_bytes: u64,
    /// `VkDeviceMemory` the allocator holds (its blocks; at least `total_bytes`).
    pub device_memory_bytes: u64,
}

impl AllocationReport {
    /// The record of the buffer named `name`.
    pub fn get(&self, name: &str) -> Option<&BufferRecord> {
        self.buffers.iter().find(|b| b.name == name)
    }
}

impl fmt::Display for AllocationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .buffers
            .iter()
            .map(|b| b.name.len())
            .max()
            .unwrap_or(0)
            .max(6);
        writeln!(
            f,
            "{:<width$}  {:>14}  {:<10}  memory",
            "buffer", "bytes", "location"
        )?;
        for b in &self.buffers {
            let memory = match (b.device_local, b.host_visible) {
                (true, true) => "device-local, host-visible",
                (true, false) => "device-local",
                (false, true) => "host-visible",
                (false, false) => "-",
            };
            writeln!(
                f,
                "{:<width$}  {:>14}  {:<10}  {memory}",
                b.name, b.bytes, b.location
            )?;
        }
        write!(
            f,
            "{} buffer(s), {} bytes allocated (peak {}), {} bytes of device memory held",
            self.buffers.len(),
            self.total_bytes,
            self.peak_bytes,
            self.device_memory_bytes
        )
    }
}
