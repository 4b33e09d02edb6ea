//! The `VkPipelineCache`, persisted under the user's cache directory.
//!
//! Creating a compute pipeline means compiling SPIR-V to the device's code: on a board's driver
//! (or lavapipe's JIT) that is tens of milliseconds a kernel, every start. The driver's cache
//! blob makes the second start fast. fulcrum wraps the blob in its own header and only hands it
//! to the driver when everything matches, because a driver fed a blob from another driver
//! version may reject it, or worse:
//!
//! ```text
//! offset  size  field
//!      0     8  magic "FLCMPCv1"
//!      8     4  vendorID            (u32 LE, VkPhysicalDeviceProperties)
//!     12     4  deviceID
//!     16     4  driverVersion
//!     20     4  reserved, 0
//!     24    16  pipelineCacheUUID
//!     40     8  hash of every embedded shader (kernels::shader_hash)
//!     48     8  length of the driver's blob
//!     56     4  CRC32C of the blob
//!     60     4  CRC32C of bytes 0..60
//!     64     …  the driver's blob
//! ```
//!
//! The file is `DIR/pipelines-VVVV-DDDD.bin` (vendor and device ids in hex), written
//! atomically. A missing file is a cold start; a file that is truncated, corrupt, or written
//! for another device, driver or set of shaders is *ignored* (logged at info, replaced on the
//! next save), never an error.

use std::path::PathBuf;
use std::sync::Arc;

use ash::vk;

use super::context::DeviceInfo;
use super::device::Device;
use super::options::CacheDir;
use super::{Error, Result};

const MAGIC: &[u8; 8] = b"FLCMPCv1";
const HEADER_BYTES: usize = 64;

/// What happened when the cache file was read at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheStatus {
    /// Persisting is off ([`CacheDir::Off`]).
    Off,
    /// No file yet: a cold start.
    Missing,
    /// The driver got `bytes` bytes of cached pipelines.
    Loaded { bytes: usize },
    /// The file was there but not used, for this reason.
    Rejected { reason: String },
}

/// The cache file and what loading it gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheLoad {
    pub path: Option<PathBuf>,
    pub status: CacheStatus,
}

/// The fields a cache file must match to be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheKey {
    pub vendor_id: u32,
    pub device_id: u32,
    pub driver_version: u32,
    pub uuid: [u8; 16],
    pub shader_hash: u64,
}

impl CacheKey {
    pub(crate) fn of(info: &DeviceInfo) -> CacheKey {
        CacheKey {
            vendor_id: info.vendor_id,
            device_id: info.device_id,
            driver_version: info.driver_version_raw,
            uuid: info.pipeline_cache_uuid,
            shader_hash: super::kernels::shader_hash(),
        }
    }

    fn file_name(&self) -> String {
        format!(
            "pipelines-{:04x}-{:04x}.bin",
            self.vendor_id, self.device_id
        )
    }
}

/// The file's bytes for `blob` under `key`.
pub(crate) fn encode(key: &CacheKey, blob: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + blob.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&key.vendor_id.to_le_bytes());
    out.extend_from_slice(&key.device_id.to_le_bytes());
    out.extend_from_slice(&key.driver_version.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&key.uuid);
    out.extend_from_slice(&key.shader_hash.to_le_bytes());
    out.extend_from_slice(&(blob.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(blob).to_le_bytes());
    let header_crc = crc32c::crc32c(&out);
    out.extend_from_slice(&header_crc.to_le_bytes());
    debug_assert_eq!(out.len(), HEADER_BYTES);
    out.extend_from_slice(blob);
    out
}

/// The driver's blob inside `file` if the file is whole and written for `key`; otherwise why
/// not.
pub(crate) fn decode<'a>(key: &CacheKey, file: &'a [u8]) -> std::result::Result<&'a [u8], String> {
    if file.len() < HEADER_BYTES {
        return Err(format!(
            "truncated ({} bytes, header is {HEADER_BYTES})",
            file.len()
        ));
    }
    let u32_at = |o: usize| u32::from_le_bytes(file[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(file[o..o + 8].try_into().unwrap());
    if &file[..8] != MAGIC {
        return Err("not a fulcrum pipeline cache (bad magic)".to_owned());
    }
    if crc32c::crc32c(&file[..60]) != u32_at(60) {
        return Err("header checksum mismatch (corrupt file)".to_owned());
    }
    let found = CacheKey {
        vendor_id: u32_at(8),
        device_id: u32_at(12),
        driver_version: u32_at(16),
        uuid: file[24..40].try_into().unwrap(),
        shader_hash: u64_at(40),
    };
    if (found.vendor_id, found.device_id) != (key.vendor_id, key.device_id) {
        return Err(format!(
            "written for device {:04x}:{:04x}",
            found.vendor_id, found.device_id
        ));
    }
    if found.driver_version != key.driver_version || found.uuid != key.uuid {
        return Err("written by another driver version".to_owned());
    }
    if found.shader_hash != key.shader_hash {
        return Err("written for other shaders (fulcrum was updated)".to_owned());
    }
    let blob = &file[HEADER_BYTES..];
    if blob.len() as u64 != u64_at(48) {
        return Err(format!(
            "truncated (blob is {} bytes, header says {})",
            blob.len(),
            u64_at(48)
        ));
    }
    if crc32c::crc32c(blob) != u32_at(56) {
        return Err("blob checksum mismatch (corrupt file)".to_owned());
    }
    Ok(blob)
}

/// The engine's `VkPipelineCache` and its file.
pub(crate) struct PipelineCache {
    pub(crate) raw: vk::PipelineCache,
    key: CacheKey,
    load: CacheLoad,
    device: Arc<Device>,
}

impl PipelineCache {
    /// Reads the file (if any and if valid) and creates the cache from it.
    pub(crate) fn open(device: &Arc<Device>, dir: &CacheDir) -> Result<PipelineCache> {
        let key = CacheKey::of(&device.info);
        let path = dir.dir().map(|d| d.join(key.file_name()));
        let file = path.as_deref().map(std::fs::read);
        let (status, blob): (CacheStatus, &[u8]) = match &file {
            None => (CacheStatus::Off, &[]),
            Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => (CacheStatus::Missing, &[]),
            Some(Err(e)) => (
                CacheStatus::Rejected {
                    reason: format!("unreadable: {e}"),
                },
                &[],
            ),
            Some(Ok(bytes)) => match decode(&key, bytes) {
                Ok(blob) => (CacheStatus::Loaded { bytes: blob.len() }, blob),
                Err(reason) => (CacheStatus::Rejected { reason }, &[]),
            },
        };
        let info = vk::PipelineCacheCreateInfo::default().initial_data(blob);
        // SAFETY: a valid device; `blob` is either empty or a blob this same device, driver
        // version and pipelineCacheUUID produced (checked above, checksummed).
        let created = unsafe { device.raw.create_pipeline_cache(&info, None) };
        let (raw, status) = match created {
            Ok(raw) => (raw, status),
            Err(result) if !blob.is_empty() => {
                // The driver refused the blob: start empty rather than fail.
                let empty = vk::PipelineCacheCreateInfo::default();
                // SAFETY: as above, with no initial data.
                let raw = unsafe { device.raw.create_pipeline_cache(&empty, None) }
                    .map_err(Error::vk("vkCreatePipelineCache"))?;
                let reason = format!("the driver refused it ({result})");
                (raw, CacheStatus::Rejected { reason })
            }
            Err(result) => {
                return Err(Error::Vk {
                    what: "vkCreatePipelineCache",
                    result,
                })
            }
        };
        match (&status, &path) {
            (CacheStatus::Rejected { reason }, Some(p)) => log::info!(
                "Vulkan: pipeline cache {} not used: {reason}; it will be rewritten",
                p.display()
            ),
            (CacheStatus::Loaded { bytes }, Some(p)) => {
                log::debug!(
                    "Vulkan: pipeline cache {} loaded ({bytes} bytes)",
                    p.display()
                )
            }
            _ => {}
        }
        Ok(PipelineCache {
            raw,
            key,
            load: CacheLoad { path, status },
            device: Arc::clone(device),
        })
    }

    pub(crate) fn load(&self) -> &CacheLoad {
        &self.load
    }

    /// Writes the driver's current blob to the file (atomically). Returns the bytes written,
    /// or `None` when persisting is off.
    pub(crate) fn save(&self) -> Result<Option<usize>> {
        let Some(path) = &self.load.path else {
            return Ok(None);
        };
        // SAFETY: the cache belongs to this device; no other thread uses it during the call
        // (the engine holds it behind `&self` calls that only create pipelines, which Vulkan
        // allows concurrently with reading the data).
        let blob = unsafe { self.device.raw.get_pipeline_cache_data(self.raw) }
            .map_err(Error::vk("vkGetPipelineCacheData"))?;
        let io = |source| Error::CacheIo {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let bytes = encode(&self.key, &blob);
        crate::durable::write_atomic(path, &bytes).map_err(io)?;
        Ok(Some(bytes.len()))
    }
}

impl Drop for PipelineCache {
    fn drop(&mut self) {
        // SAFETY: made from this device (alive: we hold an Arc), destroyed once; pipelines made
        // through it do not need it afterwards.
        unsafe { self.device.raw.destroy_pipeline_cache(self.raw, None) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CacheKey {
        CacheKey {
            vendor_id: 0x10005,
            device_id: 0,
            driver_version: 42,
            uuid: [7; 16],
            shader_hash: 0xdead_beef,
        }
    }

    #[test]
    fn round_trip_and_every_mismatch_is_named() {
        let k = key();
        let file = encode(&k, b"driver blob");
        assert_eq!(decode(&k, &file).unwrap(), b"driver blob");

        let other = |f: fn(&mut CacheKey)| {
            let mut k2 = k;
            f(&mut k2);
            decode(&k2, &file).unwrap_err()
        };
        assert!(other(|k| k.device_id = 1).contains("device"));
        assert!(other(|k| k.driver_version = 43).contains("driver"));
        assert!(other(|k| k.uuid[0] = 0).contains("driver"));
        assert!(other(|k| k.shader_hash = 1).contains("shaders"));
    }

    #[test]
    fn corrupt_and_truncated_files_are_refused() {
        let k = key();
        let file = encode(&k, b"driver blob");
        assert!(decode(&k, &file[..10]).unwrap_err().contains("truncated"));
        assert!(decode(&k, &file[..file.len() - 1])
            .unwrap_err()
            .contains("truncated"));
        let mut bad = file.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(decode(&k, &bad).unwrap_err().contains("blob checksum"));
        let mut bad = file.clone();
        bad[12] ^= 1;
        assert!(decode(&k, &bad).unwrap_err().contains("header checksum"));
        let mut bad = file;
        bad[0] = b'X';
        assert!(decode(&k, &bad).unwrap_err().contains("magic"));
        assert!(decode(&k, b"").unwrap_err().contains("truncated"));
    }
}
