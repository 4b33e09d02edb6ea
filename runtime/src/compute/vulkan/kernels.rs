//! The table of GPU kernels: every compute shader fulcrum embeds, declared once here.
//!
//! A kernel is one GLSL file `shaders/NAME.comp`, compiled by `tools/scripts/build-shaders.sh`
//! into the committed `shaders/NAME.spv` and embedded with `include_bytes!` (building fulcrum
//! needs no shader compiler). Its entry says what the pipeline needs to know: the storage
//! buffers it binds (set 0, bindings `0..bindings`), its push-constant bytes, its workgroup
//! size and which specialisation constants override it, and its shared memory.
//!
//! Kernels respect the weakest target fulcrum runs on: at most [`MAX_INVOCATIONS`]
//! invocations per workgroup and [`MAX_SHARED_BYTES`] of shared memory, and no fp16
//! arithmetic required. The pipeline refuses a workgroup size above the limit; a unit test
//! checks every table entry.
//!
//! To add a kernel: write `shaders/NAME.comp`, run the script, add a variant to [`Kernel`]
//! and its entry in [`Kernel::info`] (and in [`Kernel::ALL`]).

use std::sync::OnceLock;

/// Workgroup invocations every kernel must stay within (Raspberry Pi's V3D: 256).
pub const MAX_INVOCATIONS: u32 = 256;
/// Shared memory every kernel must stay within (V3D: 16 KiB).
pub const MAX_SHARED_BYTES: u32 = 16 * 1024;

/// A GPU kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `y[i] = a * x[i] + y[i]` for `i < n`: bindings `x` (read), `y` (read-write); push
    /// constants `{ n: u32, a: f32 }`; workgroup size x = specialisation constant 0
    /// (default 64). The engine's proof kernel.
    Saxpy,
}

/// What the pipeline needs to know about a kernel.
#[derive(Debug)]
pub struct KernelInfo {
    pub name: &'static str,
    /// The SPIR-V, as committed in `shaders/NAME.spv`.
    pub spirv: &'static [u8],
    /// Storage buffers at set 0, bindings `0..bindings`.
    pub bindings: u32,
    /// Size of the push-constant block (0: none).
    pub push_bytes: u32,
    /// The workgroup size compiled into the shader.
    pub local_size: [u32; 3],
    /// The specialisation constant ids that override each dimension (`local_size_x_id` …).
    pub local_size_ids: [Option<u32>; 3],
    /// Shared memory the kernel declares, at the largest workgroup size it allows.
    pub shared_bytes: u32,
}

macro_rules! spirv {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shaders/",
            $name,
            ".spv"
        ))
    };
}

const SAXPY: KernelInfo = KernelInfo {
    name: "saxpy",
    spirv: spirv!("saxpy"),
    bindings: 2,
    push_bytes: 8,
    local_size: [64, 1, 1],
    local_size_ids: [Some(0), None, None],
    shared_bytes: 0,
};

impl Kernel {
    /// Every kernel, in table order.
    pub const ALL: [Kernel; 1] = [Kernel::Saxpy];

    pub fn info(self) -> &'static KernelInfo {
        match self {
            Kernel::Saxpy => &SAXPY,
        }
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A 64-bit FNV-1a hash of every embedded kernel (name, length and SPIR-V, in table order).
/// The pipeline cache file records it: a cache written for other shaders is not loaded.
pub fn shader_hash() -> u64 {
    static HASH: OnceLock<u64> = OnceLock::new();
    *HASH.get_or_init(|| {
        let mut h = Fnv::new();
        for k in Kernel::ALL {
            let info = k.info();
            h.write(info.name.as_bytes());
            h.write(&(info.spirv.len() as u64).to_le_bytes());
            h.write(info.spirv);
        }
        h.0
    })
}

/// FNV-1a, 64 bits: stable across builds and platforms (unlike `std`'s hasher).
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_valid_spirv_within_the_weakest_target() {
        for k in Kernel::ALL {
            let info = k.info();
            assert_eq!(info.spirv.len() % 4, 0, "{k}: SPIR-V is whole words");
            assert_eq!(
                &info.spirv[..4],
                &0x0723_0203u32.to_le_bytes(),
                "{k}: SPIR-V magic"
            );
            let invocations: u32 = info.local_size.iter().product();
            assert!(
                invocations <= MAX_INVOCATIONS,
                "{k}: {invocations} invocations"
            );
            assert!(info.shared_bytes <= MAX_SHARED_BYTES, "{k}: shared memory");
            assert!(
                info.push_bytes % 4 == 0 && info.push_bytes <= 128,
                "{k}: push constants"
            );
            assert!(info.bindings >= 1, "{k}: bindings");
        }
    }

    #[test]
    fn table_is_in_variant_order_and_names_are_unique() {
        let mut names: Vec<_> = Kernel::ALL.iter().map(|k| k.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Kernel::ALL.len());
    }

    #[test]
    fn fnv_is_the_reference_fnv1a() {
        let mut h = Fnv::new();
        h.write(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
        assert_eq!(shader_hash(), shader_hash());
    }
}
