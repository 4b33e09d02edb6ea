//! Where a run's ring slots live; the memory itself is [`crate::base::SlotMemory`].

/// Where a run's ring slots live (`--ring-memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RingMemory {
    /// Memory the engine reads batches from directly, where it offers some (Vulkan devices
    /// that import host memory); plain host memory otherwise.
    #[default]
    Auto,
    /// Plain host memory: the engine copies each batch in with the CPU.
    Host,
}

impl std::str::FromStr for RingMemory {
    type Err = crate::base::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(RingMemory::Auto),
            "host" => Ok(RingMemory::Host),
            _ => Err(crate::base::UnknownChoice::new(
                "ring memory",
                s,
                "auto or host",
            )),
        }
    }
}
