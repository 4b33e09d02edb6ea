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
    /// CPU engine threads, 1 to 16 (more than the cores is slower) [default: every core;
    /// loaders need a small share, see `fulcrum balance`].
    #[arg(long, value_parser = crate::args::threads)]
    pub threads: Option<usize>,
    /// Enable the Khronos validation layer (slow; for debugging shaders).
    #[arg(long)]
    pub validation: bool,
    /// Vulkan: run the forward pass's convolutions (stem, depthwise, pointwise) with f16
    /// operands and f32 sums where the device offers shaderFloat16 (faster on most GPUs;
    /// about 5e-4 of the largest output in error, so meant for inference; gradients stay f32).
    #[arg(long)]
    pub fp16: bool,
}

impl EngineArgs {
    /// Engine options.
    pub fn options(&self, mem_budget: Option<u64>) -> ExecOptions {
        if let Some(threads) = self.threads {
            crate::args::warn_threads("--threads", threads);
        }
        ExecOptions {
            engine: self.engine,
            device: self.device,
            threads: self.threads.unwrap_or_else(fulcrum_board::host_cores),
            per_kernel_timing: false,
            validation: self.validation,
            mem_budget,
            fp16: self.fp16,
        }
    }
}
