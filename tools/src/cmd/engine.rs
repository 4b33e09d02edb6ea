//! Options choosing the compute engine, shared by `train`, `eval`, `infer` and `bench compute`.

use fulcrum::compute::exec::{EngineChoice, ExecOptions};

#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// Compute engine: auto takes a Vulkan GPU when there is one and the CPU engine otherwise
    /// (a CPU-type Vulkan device such as lavapipe is slower than the CPU engine: auto skips it).
    #[arg(long, default_value = "auto")]
    pub engine: EngineChoice,
    /// Vulkan device index, as `fulcrum devices` lists them [default: the best].
    #[arg(long)]
    pub device: Option<usize>,
    /// CPU engine threads [default: the cores not given to loaders].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Enable the Khronos validation layer (slow; for debugging shaders).
    #[arg(long)]
    pub validation: bool,
}

impl EngineArgs {
    /// Engine options, with `loaders` threads kept free for the input pipeline.
    pub fn options(&self, loaders: usize, mem_budget: Option<u64>) -> ExecOptions {
        let cores = fulcrum_board::host_cores();
        ExecOptions {
            engine: self.engine,
            device: self.device,
            threads: self
                .threads
                .unwrap_or_else(|| cores.saturating_sub(loaders).max(1)),
            per_kernel_timing: false,
            validation: self.validation,
            mem_budget,
        }
    }
}
