//! What every layer may use: the memory plan and size helpers, the calling thread's CPU
//! time, the crate's deterministic PRNG and hashes, the memory behind ring slots with the
//! slot bytes handed to engines, and the option parsers' errors. Nothing here imports the
//! rest of the crate but `text`, for quoting values in those errors (docs/architecture.md
//! gives the order of the layers).

mod cpu_time;
mod memory;
mod parse;
mod random;
mod slot;

pub use cpu_time::thread_cpu_time;
pub use memory::{
    human, largest_fitting, parse_size, peak_resident, process_memory_limit, resident,
    resident_files, MemoryPlan, PlanItem, ProcessLimit,
};
pub use parse::{BadQuantity, UnknownChoice};
pub use random::{derive_seed, mix64, SplitMix64, GOLDEN_GAMMA};
pub use slot::{HostMemory, ImportId, ImportedAt, SlotAllocator, SlotBytes, SlotError, SlotMemory};

/// The memory page: ring slots and records are whole pages, aligned to one (`O_DIRECT`
/// reads).
pub const PAGE_SIZE: usize = 4096;
