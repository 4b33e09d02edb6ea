//! Options of the input pipeline shared by `load` and `bench io`.

use fulcrum::io::{DirectMode, IoKind, UringOptions};
use fulcrum::loader::{AugmentConfig, LoaderConfig, OnCorrupt};

#[derive(clap::Args, Clone)]
pub struct PipelineArgs {
    /// Records per batch (B).
    #[arg(long, default_value_t = 32, value_parser = crate::args::count_usize(crate::args::MAX_BATCH))]
    pub batch: usize,
    /// Ring slots (prefetch depth D), each one batch; 1 to 64.
    #[arg(long, default_value_t = 4, value_parser = crate::args::count_usize(crate::args::MAX_RING))]
    pub ring: usize,
    /// Loader threads (C) [default: one per core].
    #[arg(long, value_parser = crate::args::count_usize(crate::args::MAX_LOADERS))]
    pub loaders: Option<usize>,
    /// Read backend: auto prefers io_uring and falls back to pread where it is unavailable.
    #[arg(long, default_value = "auto")]
    pub io: IoKind,
    /// O_DIRECT reads: auto uses them where the filesystem allows.
    #[arg(long, default_value = "auto")]
    pub direct: DirectMode,
    /// io_uring reads in flight per loader thread.
    #[arg(long, default_value_t = 32, value_parser = crate::args::count(crate::args::MAX_IO_DEPTH))]
    pub queue_depth: u32,
    /// io_uring kernel submission polling (saves syscalls, burns a core: opt-in).
    #[arg(long)]
    pub sqpoll: bool,
    /// Corrupt records: fail names the record and stops; skip replaces it and counts it.
    #[arg(long, default_value = "fail")]
    pub on_corrupt: OnCorrupt,
    /// Turn augmentation (flip, scale/translate, brightness/contrast, saturation and white
    /// balance) off.
    #[arg(long)]
    pub no_augment: bool,
    /// Chance (0 to 1) that a record becomes a mosaic of four records of its batch (as
    /// `train --mosaic`).
    #[arg(long, default_value_t = 0.0, value_parser = crate::args::probability, value_name = "P")]
    pub mosaic: f32,
    /// Hard memory limit for the pipeline (e.g. 64M, 1.5G): a configuration over it is refused
    /// before anything is allocated, naming the batch or ring depth that would fit.
    #[arg(long, value_parser = fulcrum::base::parse_size)]
    pub mem_budget: Option<u64>,
    /// Seed of the epoch order and augmentation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl PipelineArgs {
    pub fn loaders(&self) -> usize {
        self.loaders.unwrap_or_else(fulcrum_board::host_cores)
    }

    pub fn loader_config(&self, epochs: u64) -> LoaderConfig {
        LoaderConfig {
            batch: self.batch,
            ring_slots: self.ring,
            loaders: self.loaders(),
            seed: self.seed,
            epochs,
            augment: if self.no_augment {
                AugmentConfig::off()
            } else {
                AugmentConfig {
                    mosaic_prob: self.mosaic,
                    ..AugmentConfig::default()
                }
            },
            on_corrupt: self.on_corrupt,
            io: self.io,
            uring: UringOptions {
                queue_depth: self.queue_depth,
                sqpoll: self.sqpoll,
            },
            pin: fulcrum_board::detect().loader_cores(),
            mem_budget: self.mem_budget,
            ..LoaderConfig::default()
        }
    }
}
