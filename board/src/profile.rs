//! Board profiles: what fulcrum expects of each supported single-board computer before it has
//! measured anything (cores and their layout, typical memory, boot storage, GPU). Numbers here
//! are seeds for the balance equation and the memory budget; the runtime measures the real ones.

use core::fmt;

/// A set of CPU core indices (0..32) as a bitmask: small, `Copy`, usable in `const` profiles.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CoreSet(u32);

impl CoreSet {
    /// Largest core count a set can hold.
    pub const CAPACITY: usize = 32;
    pub const EMPTY: CoreSet = CoreSet(0);

    /// The set whose bit `i` is core `i`.
    pub const fn from_bits(bits: u32) -> Self {
        CoreSet(bits)
    }

    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Cores `start..end`. Panics (at compile time in consts) if `start > end` or `end > 32`.
    pub const fn range(start: usize, end: usize) -> Self {
        assert!(
            start <= end && end <= Self::CAPACITY,
            "CoreSet::range out of 0..32"
        );
        let width = end - start;
        let mask = if width == Self::CAPACITY {
            u32::MAX
        } else {
            (1u32 << width) - 1
        };
        CoreSet(mask << start)
    }

    /// This set plus `core`. Panics if `core >= 32`.
    pub const fn with(self, core: usize) -> Self {
        assert!(core < Self::CAPACITY, "CoreSet core index >= 32");
        CoreSet(self.0 | (1 << core))
    }

    /// Whether `core` is in the set (false for any index >= 32).
    pub const fn contains(self, core: usize) -> bool {
        core < Self::CAPACITY && self.0 & (1 << core) != 0
    }

    pub const fn count(self) -> usize {
        self.0.count_ones() as usize
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub const fn union(self, other: CoreSet) -> Self {
        CoreSet(self.0 | other.0)
    }

    pub const fn intersection(self, other: CoreSet) -> Self {
        CoreSet(self.0 & other.0)
    }

    pub const fn difference(self, other: CoreSet) -> Self {
        CoreSet(self.0 & !other.0)
    }

    /// Core indices in ascending order.
    pub fn iter(self) -> CoreSetIter {
        CoreSetIter(self.0)
    }
}

impl IntoIterator for CoreSet {
    type Item = usize;
    type IntoIter = CoreSetIter;
    fn into_iter(self) -> CoreSetIter {
        self.iter()
    }
}

/// Iterator over the cores of a [`CoreSet`], lowest first.
#[derive(Clone, Debug)]
pub struct CoreSetIter(u32);

impl Iterator for CoreSetIter {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let core = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1; // clear the lowest set bit
        Some(core)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for CoreSetIter {}

/// Prints as a list (`{4, 5, 6, 7}`), which reads better than the bitmask.
impl fmt::Debug for CoreSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Where the root file system (and so the packed shards, by default) lives. It decides how
/// much read bandwidth and queue depth to expect: an SD card does a few MB/s of random reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum StorageKind {
    SdCard,
    Emmc,
    Nvme,
    Usb,
    Unknown,
}

/// What GPU a board is expected to have; the runtime still probes Vulkan and measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct GpuExpectation {
    /// Vulkan driver / GPU, e.g. `"V3DV"`, `"PanVK (Mali-G610)"`; `None`: none expected or unknown.
    pub driver: Option<&'static str>,
    /// GPU and CPU share DRAM: ring slots can be host-visible device memory, no copy.
    pub unified_memory: bool,
    /// The GPU is expected to run small detectors slower than the CPU engine, so compute
    /// defaults to the CPU and loaders share the cores with it.
    pub slower_than_cpu: bool,
}

impl GpuExpectation {
    /// No GPU expected (or not known until probed).
    pub const NONE: GpuExpectation = GpuExpectation {
        driver: None,
        unified_memory: false,
        slower_than_cpu: false,
    };
}

/// The boards fulcrum has a profile for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BoardId {
    Pi4,
    Pi5,
    OrinNano,
    Rk3588,
    Generic,
}

impl BoardId {
    /// The short id used on the command line and in configs: `pi4`, `pi5`, `orin-nano`, `rk3588`,
    /// `generic`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BoardId::Pi4 => "pi4",
            BoardId::Pi5 => "pi5",
            BoardId::OrinNano => "orin-nano",
            BoardId::Rk3588 => "rk3588",
            BoardId::Generic => "generic",
        }
    }
}

impl fmt::Display for BoardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A board's expected hardware. `0` in `cores` / `memory_mib` means "read it at run time"
/// (the generic host).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BoardProfile {
    pub id: BoardId,
    pub name: &'static str,
    pub cores: u8,
    /// The fast cores. On symmetric boards: all cores.
    pub big_cores: CoreSet,
    /// The efficiency cores; empty on symmetric boards.
    pub little_cores: CoreSet,
    /// Typical RAM of the common variant, MiB. The memory budget uses the measured value.
    pub memory_mib: u32,
    pub storage: StorageKind,
    pub gpu: GpuExpectation,
}

/// Raspberry Pi 4 Model B (BCM2711). V3D's Vulkan driver pays a high per-dispatch cost, so the
/// four A72s beat it on a 25 MFLOP detector.
pub const PI4: &BoardProfile = &BoardProfile {
    id: BoardId::Pi4,
    name: "Raspberry Pi 4",
    cores: 4,
    big_cores: CoreSet::range(0, 4),
    little_cores: CoreSet::EMPTY,
    memory_mib: 4096,
    storage: StorageKind::SdCard,
    gpu: GpuExpectation {
        driver: Some("V3DV"),
        unified_memory: true,
        slower_than_cpu: true,
    },
};

/// Raspberry Pi 5 (BCM2712). Faster V3D 7, but still behind four A76s for small models.
/// Boots from SD unless an NVMe HAT is fitted; the profile assumes the common case.
pub const PI5: &BoardProfile = &BoardProfile {
    id: BoardId::Pi5,
    name: "Raspberry Pi 5",
    cores: 4,
    big_cores: CoreSet::range(0, 4),
    little_cores: CoreSet::EMPTY,
    memory_mib: 8192,
    storage: StorageKind::SdCard,
    gpu: GpuExpectation {
        driver: Some("V3DV"),
        unified_memory: true,
        slower_than_cpu: true,
    },
};

/// Jetson Orin Nano 8 GB developer kit: 6× Cortex-A78AE, Ampere GPU sharing the 8 GB LPDDR5.
/// The dev kit usually runs from an M.2 NVMe.
pub const ORIN_NANO: &BoardProfile = &BoardProfile {
    id: BoardId::OrinNano,
    name: "Jetson Orin Nano",
    cores: 6,
    big_cores: CoreSet::range(0, 6),
    little_cores: CoreSet::EMPTY,
    memory_mib: 8192,
    storage: StorageKind::Nvme,
    gpu: GpuExpectation {
        driver: Some("NVIDIA (Ampere)"),
        unified_memory: true,
        slower_than_cpu: false,
    },
};

/// RK3588(S) boards (Radxa ROCK 5, Orange Pi 5, ...). Linux numbers the A55 cluster first:
/// cores 0-3 are the little A55s, 4-7 the big A76s.
pub const RK3588: &BoardProfile = &BoardProfile {
    id: BoardId::Rk3588,
    name: "RK3588",
    cores: 8,
    big_cores: CoreSet::range(4, 8),
    little_cores: CoreSet::range(0, 4),
    memory_mib: 8192,
    storage: StorageKind::Emmc,
    gpu: GpuExpectation {
        driver: Some("PanVK (Mali-G610)"),
        unified_memory: true,
        slower_than_cpu: false,
    },
};

/// Any other Linux machine: everything is read or probed at run time.
pub const GENERIC: &BoardProfile = &BoardProfile {
    id: BoardId::Generic,
    name: "generic host",
    cores: 0,
    big_cores: CoreSet::EMPTY,
    little_cores: CoreSet::EMPTY,
    memory_mib: 0,
    storage: StorageKind::Unknown,
    gpu: GpuExpectation::NONE,
};

/// Every profile, generic last.
pub const ALL: &[&BoardProfile] = &[PI4, PI5, ORIN_NANO, RK3588, GENERIC];

impl BoardProfile {
    pub const fn by_id(id: BoardId) -> &'static BoardProfile {
        match id {
            BoardId::Pi4 => PI4,
            BoardId::Pi5 => PI5,
            BoardId::OrinNano => ORIN_NANO,
            BoardId::Rk3588 => RK3588,
            BoardId::Generic => GENERIC,
        }
    }

    /// Looks a profile up by its id (`pi4`, `pi5`, `orin-nano`, `rk3588`, `generic`), ASCII
    /// case-insensitive; `_` is accepted for `-`, and `rpi4`/`rpi5`/`host` as aliases.
    pub fn by_name(name: &str) -> Option<&'static BoardProfile> {
        const ALIASES: &[(&str, BoardId)] = &[
            ("rpi4", BoardId::Pi4),
            ("rpi5", BoardId::Pi5),
            ("orin_nano", BoardId::OrinNano),
            ("host", BoardId::Generic),
        ];
        let name = name.trim();
        ALL.iter()
            .map(|p| (p.id.as_str(), p.id))
            .chain(ALIASES.iter().copied())
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, id)| Self::by_id(id))
    }

    /// Big and little cores are both present (big.LITTLE / DynamIQ).
    pub const fn is_heterogeneous(&self) -> bool {
        !self.big_cores.is_empty() && !self.little_cores.is_empty()
    }

    /// Cores to pin the input loaders to; empty means "do not pin, let the OS schedule".
    ///
    /// On big.LITTLE boards loaders go to the little cores: loading is I/O waits, memcpy and
    /// light augmentation, which the A55s handle, and pinning keeps the scheduler from moving
    /// them onto the big cores that compute needs. On symmetric boards any core is as good as
    /// another, so pinning only takes flexibility away; the balance equation sizes the loader
    /// count instead. The runtime should intersect this with the process's allowed affinity.
    pub const fn loader_cores(&self) -> CoreSet {
        if self.is_heterogeneous() {
            self.little_cores
        } else {
            CoreSet::EMPTY
        }
    }

    /// Cores for CPU compute (the CPU engine, or the thread feeding the GPU); empty means "do
    /// not pin". The counterpart of [`loader_cores`](Self::loader_cores).
    pub const fn compute_cores(&self) -> CoreSet {
        if self.is_heterogeneous() {
            self.big_cores
        } else {
            CoreSet::EMPTY
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::{format, vec::Vec};

    #[test]
    fn core_set_ops() {
        let s = CoreSet::range(4, 8);
        assert_eq!(s.bits(), 0xF0);
        assert_eq!(s.count(), 4);
        assert!(s.contains(4) && s.contains(7));
        assert!(!s.contains(3) && !s.contains(8) && !s.contains(1000));
        assert_eq!(s.iter().collect::<Vec<_>>(), [4, 5, 6, 7]);
        assert_eq!(s.iter().len(), 4);
        assert_eq!(format!("{s:?}"), "{4, 5, 6, 7}");

        let t = CoreSet::EMPTY.with(0).with(5);
        assert_eq!(t.union(s).count(), 5);
        assert_eq!(t.intersection(s), CoreSet::EMPTY.with(5));
        assert_eq!(s.difference(t).into_iter().collect::<Vec<_>>(), [4, 6, 7]);
        assert!(CoreSet::EMPTY.is_empty() && CoreSet::range(3, 3).is_empty());
        assert_eq!(CoreSet::range(0, 32).bits(), u32::MAX);
        assert_eq!(CoreSet::from_bits(1 << 31).iter().collect::<Vec<_>>(), [31]);
    }

    #[test]
    #[should_panic]
    fn core_set_range_past_32_panics() {
        let _ = CoreSet::range(0, 33);
    }

    #[test]
    fn profiles_are_consistent() {
        for p in ALL {
            assert_eq!(BoardProfile::by_id(p.id), *p);
            // Big and little never overlap and together cover exactly `cores` cores.
            assert!(
                p.big_cores.intersection(p.little_cores).is_empty(),
                "{}",
                p.name
            );
            assert_eq!(
                p.big_cores.union(p.little_cores).count(),
                p.cores as usize,
                "{}",
                p.name
            );
        }
        assert!(PI4.gpu.slower_than_cpu && PI5.gpu.slower_than_cpu);
        assert!(!ORIN_NANO.gpu.slower_than_cpu && ORIN_NANO.gpu.unified_memory);
        assert_eq!(RK3588.gpu.driver, Some("PanVK (Mali-G610)"));
        assert_eq!((GENERIC.cores, GENERIC.memory_mib), (0, 0));
    }

    #[test]
    fn by_name_accepts_ids_and_aliases() {
        assert_eq!(BoardProfile::by_name("pi4"), Some(PI4));
        assert_eq!(BoardProfile::by_name("PI5"), Some(PI5));
        assert_eq!(BoardProfile::by_name("rpi5"), Some(PI5));
        assert_eq!(BoardProfile::by_name("orin-nano"), Some(ORIN_NANO));
        assert_eq!(BoardProfile::by_name("orin_nano"), Some(ORIN_NANO));
        assert_eq!(BoardProfile::by_name(" rk3588 "), Some(RK3588));
        assert_eq!(BoardProfile::by_name("generic"), Some(GENERIC));
        assert_eq!(BoardProfile::by_name("host"), Some(GENERIC));
        assert_eq!(BoardProfile::by_name("pi3"), None);
        assert_eq!(BoardProfile::by_name(""), None);
        for p in ALL {
            assert_eq!(BoardProfile::by_name(p.id.as_str()), Some(*p));
        }
    }

    #[test]
    fn loaders_go_to_little_cores_only_on_big_little() {
        assert_eq!(RK3588.loader_cores(), CoreSet::range(0, 4));
        assert_eq!(RK3588.compute_cores(), CoreSet::range(4, 8));
        for p in [PI4, PI5, ORIN_NANO, GENERIC] {
            assert!(p.loader_cores().is_empty(), "{}", p.name);
            assert!(p.compute_cores().is_empty(), "{}", p.name);
        }
    }
}
