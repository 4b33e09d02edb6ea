//! [`Exec`]: a [`Recording`] running on one engine, chosen by [`EngineChoice`] — the one
//! interface the trainer, the evaluator and the benches use.
//!
//! `auto` picks Vulkan on a GPU (discrete, integrated or virtual) and the CPU engine otherwise.
//! A Vulkan device of type CPU (Mesa's lavapipe) is *not* taken by `auto`: it runs the same
//! shaders on the same cores, slower than the CPU engine's kernels; `--engine vulkan` still
//! uses it (that is how the shaders are tested without a GPU). No Vulkan loader or device
//! under `auto` is a log line and the CPU engine, never a failure.

use std::sync::Arc;
use std::time::Duration;

use super::cpu::exec::{CpuExec, CpuTiming};
use super::recording::{Recording, TensorId};
use super::vulkan;
use super::vulkan::exec::VulkanExec;
use crate::base::MemoryPlan;
use crate::base::{SlotAllocator, SlotBytes};

/// Which engine to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineChoice {
    #[default]
    Auto,
    Cpu,
    Vulkan,
}

impl std::str::FromStr for EngineChoice {
    type Err = crate::base::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(EngineChoice::Auto),
            "cpu" => Ok(EngineChoice::Cpu),
            "vulkan" => Ok(EngineChoice::Vulkan),
            _ => Err(crate::base::UnknownChoice::new(
                "engine",
                s,
                "auto, cpu or vulkan",
            )),
        }
    }
}

/// How to set up the engine.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    pub engine: EngineChoice,
    /// Vulkan device index (`fulcrum devices`); `None`: the best.
    pub device: Option<usize>,
    /// CPU engine threads; 0: every core.
    pub threads: usize,
    /// GPU timestamps per dispatch (per-kernel figures) rather than per step.
    pub per_kernel_timing: bool,
    /// Enable the Khronos validation layer.
    pub validation: bool,
    /// Refuse a recording whose tensors need more than this many bytes.
    pub mem_budget: Option<u64>,
    /// Vulkan: the fp16 kernel variants where the device offers `shaderFloat16`.
    pub fp16: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Vulkan engine: {0}")]
    Vulkan(#[from] vulkan::Error),
    #[error("Vulkan engine: {0}")]
    VulkanExec(#[from] vulkan::exec::ExecError),
    #[error("CPU engine: {0}")]
    Cpu(#[from] crate::compute::cpu::exec::SetupError),
    /// The model or the record layout a measurement asked for.
    #[error("{0}")]
    Model(String),
    #[error("{0}")]
    Access(#[from] crate::compute::recording::AccessError),
    #[error(
        "the engine plans {needed} bytes (tensors and working memory), over the memory budget \
         of {budget} bytes; \
         lower --batch or raise --mem-budget"
    )]
    Budget { needed: u64, budget: u64 },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl ExecOptions {
    fn vulkan(&self) -> vulkan::Options {
        vulkan::Options {
            validation: self.validation,
            device: self.device,
            fp16: self.fp16,
            ..vulkan::Options::default()
        }
    }

    /// The CPU engine's threads these options give: `threads`, or every core for 0.
    pub fn cpu_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// These options with the engine decided (`auto` resolved to `cpu` or `vulkan`, see the
    /// module docs) and the CPU engine's threads counted (0: every core), so that a plan made
    /// from them and the engine set up from them agree. Resolving resolved options changes
    /// nothing and lists no devices.
    pub fn resolved(&self) -> Result<ExecOptions> {
        let engine = match self.engine {
            EngineChoice::Auto if self.auto_picks_vulkan()? => EngineChoice::Vulkan,
            EngineChoice::Auto => EngineChoice::Cpu,
            chosen => chosen,
        };
        Ok(ExecOptions {
            engine,
            threads: self.cpu_threads(),
            ..self.clone()
        })
    }

    /// Whether `auto` takes a Vulkan device: one that is not a CPU (a device asked for by
    /// number is taken whatever it is). The devices are listed in a child process where one
    /// can be made ([`vulkan::probe`]), so that choosing the CPU engine leaves no Vulkan
    /// driver mapped here; in process where no child can be made, and when the child meets an
    /// error, so that the error is this process's own. A child that dies (a crashing driver,
    /// a memory limit that listing the drivers met) means the CPU engine.
    fn auto_picks_vulkan(&self) -> Result<bool> {
        use vulkan::probe::{in_child, Child, CHILD_TIMEOUT};
        const GPU: u8 = b'V';
        const CPU: u8 = b'C';
        const ERROR: u8 = b'E';
        let child = in_child(
            || match self.auto_decision() {
                Ok((true, _)) => vec![GPU],
                Ok((false, why)) => [&[CPU][..], why.as_bytes()].concat(),
                Err(_) => vec![ERROR],
            },
            CHILD_TIMEOUT,
        );
        let (gpu, why) = match child {
            Child::Answered(a) if a == [GPU] => (true, String::new()),
            Child::Answered(a) if a.first() == Some(&CPU) => {
                (false, String::from_utf8_lossy(&a[1..]).into_owned())
            }
            Child::Failed(what) => (
                false,
                format!(
                    "listing the Vulkan devices failed in a child process ({what}); using the \
                     CPU engine (--engine vulkan tries the device in this process)"
                ),
            ),
            Child::Answered(_) | Child::NotMade => self.auto_decision()?,
        };
        if !gpu {
            log::info!("engine: {why}");
        }
        Ok(gpu)
    }

    /// What `auto` decides, and when the CPU engine, why (for the log). Logs nothing: it may
    /// run in a child process.
    fn auto_decision(&self) -> Result<(bool, String)> {
        let options = self.vulkan();
        Ok(match vulkan::list_devices(&options) {
            Ok(list) => match vulkan::pick_device(&list.devices, self.device) {
                Ok(i)
                    if list.devices[i].device_type == vulkan::DeviceType::Cpu
                        && self.device.is_none() =>
                {
                    let why = format!(
                        "the only Vulkan device is {} (a CPU device): the CPU engine is faster \
                         on the same cores (--engine vulkan uses it anyway)",
                        list.devices[i].label()
                    );
                    (false, why)
                }
                Ok(_) => (true, String::new()),
                // A device asked for by number and missing is a mistake, not a fallback.
                Err(e) if self.device.is_some() => return Err(e.into()),
                Err(e) => (false, format!("{e}; using the CPU engine")),
            },
            Err(e) if e.is_unavailable() => (false, format!("{e}; using the CPU engine")),
            Err(e) => return Err(e.into()),
        })
    }
}

const NO_GPU_FRAMES: &str = "the frame pass runs on the GPU only on the Vulkan engine";

/// How long one run took on the device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunTiming {
    /// The step on the device: GPU timestamps on Vulkan (wall time where the queue has none),
    /// wall time on the CPU engine.
    pub device: Duration,
    /// Host wall time of the call (submission and waiting included).
    pub wall: Duration,
    /// Per dispatch (Vulkan) or per step (CPU), when per-kernel timing is on.
    pub per_kernel: Vec<Duration>,
}

impl From<CpuTiming> for RunTiming {
    fn from(t: CpuTiming) -> RunTiming {
        RunTiming {
            device: t.wall,
            wall: t.wall,
            per_kernel: t.per_step,
        }
    }
}

impl From<vulkan::Timing> for RunTiming {
    fn from(t: vulkan::Timing) -> RunTiming {
        RunTiming {
            device: t.gpu.unwrap_or(t.wall),
            wall: t.wall,
            per_kernel: t.per_dispatch,
        }
    }
}

/// A recording on an engine.
#[derive(Debug)]
pub enum Exec {
    Cpu(Box<CpuExec>),
    Vulkan(Box<VulkanExec>),
}

impl Exec {
    /// Sets up `recording` on the engine `options` choose (see the module docs), refusing it
    /// where its [`Exec::memory_plan`] is over `options.mem_budget`.
    pub fn new(recording: &Recording, options: &ExecOptions) -> Result<Exec> {
        let options = options.resolved()?;
        if let Some(budget) = options.mem_budget {
            let needed = Self::memory_plan(recording, &options)?.total();
            if needed > budget {
                return Err(Error::Budget { needed, budget });
            }
        }
        if options.engine == EngineChoice::Vulkan {
            let engine = vulkan::Engine::new(&options.vulkan())?;
            let exec = VulkanExec::new(
                engine,
                recording,
                options.per_kernel_timing,
                options.mem_budget,
            )
            .map_err(Error::VulkanExec)?;
            Ok(Exec::Vulkan(Box::new(exec)))
        } else {
            let mut exec = CpuExec::new(recording, options.threads)?;
            exec.set_per_step_timing(options.per_kernel_timing);
            Ok(Exec::Cpu(Box::new(exec)))
        }
    }

    /// Everything the engine `options` choose allocates for `recording`, item by item, made
    /// without allocating: the CPU engine's shared tensor buffers and kernel scratch, or the
    /// Vulkan engine's buffers and reduction scratch. Callers add their own (the loader's,
    /// the predictor's) and check the sum against the budget.
    pub fn memory_plan(recording: &Recording, options: &ExecOptions) -> Result<MemoryPlan> {
        let options = options.resolved()?;
        match options.engine {
            EngineChoice::Vulkan => {
                VulkanExec::memory_plan(recording).map_err(|e| Error::VulkanExec(e.into()))
            }
            _ => Ok(CpuExec::memory_plan(recording, options.threads)),
        }
    }

    /// `cpu (2 threads, avx2 kernels)` or `vulkan: NAME (type)[, fp16 forward convs][,
    /// direct kernels][, subgroup sums]` (with both, the forward convs are the GPUs' kernels
    /// in f16 and the rest direct).
    pub fn describe(&self) -> String {
        match self {
            Exec::Cpu(c) => format!(
                "cpu ({} thread{}, {} kernels)",
                c.threads(),
                if c.threads() == 1 { "" } else { "s" },
                c.kernels()
            ),
            Exec::Vulkan(v) => {
                let variants = v.engine().variants();
                format!(
                    "vulkan: {}{}{}{}",
                    v.engine().info().label(),
                    if variants.fp16 {
                        ", fp16 forward convs"
                    } else {
                        ""
                    },
                    if variants.direct {
                        ", direct kernels"
                    } else {
                        ""
                    },
                    if variants.subgroups {
                        ", subgroup sums"
                    } else {
                        ""
                    }
                )
            }
        }
    }

    /// Host cores the engine keeps busy while it runs: its threads on the CPU, none on a GPU
    /// (the host thread waits for the fence).
    pub fn host_threads(&self) -> usize {
        match self {
            Exec::Cpu(c) => c.threads(),
            Exec::Vulkan(_) => 0,
        }
    }

    /// Memory for the loader's ring that this engine reads batches from directly: on Vulkan
    /// where the device imports host memory ([`vulkan::HostImporter`]); `None` otherwise (the
    /// CPU engine, and devices without `VK_EXT_external_memory_host`: plain host memory).
    pub fn slot_allocator(&self) -> Option<Arc<dyn SlotAllocator>> {
        match self {
            Exec::Cpu(_) => None,
            Exec::Vulkan(v) => v
                .engine()
                .slot_allocator()
                .map(|a| Arc::new(a) as Arc<dyn SlotAllocator>),
        }
    }

    /// Uploads so far that the device copied from imported host memory (ring slots from
    /// [`Exec::slot_allocator`]), the CPU copying nothing; 0 on the CPU engine.
    pub fn imported_uploads(&self) -> u64 {
        match self {
            Exec::Cpu(_) => 0,
            Exec::Vulkan(v) => v.engine().imported_uploads(),
        }
    }

    /// What the CPU engine chose for the forward convs of `entry` with fewer images than
    /// threads (see [`CpuExec::split_choice`]); `None` on a GPU.
    pub fn cpu_split_choice(&self, entry: usize) -> Option<crate::compute::cpu::exec::SplitChoice> {
        match self {
            Exec::Cpu(c) => Some(c.split_choice(entry)),
            Exec::Vulkan(_) => None,
        }
    }

    /// The CPU engine's thread pool, where it has one (more than one thread); `None` on a
    /// GPU. Host work around the engine (the frame pass) can split over it between runs.
    pub fn cpu_pool(&self) -> Option<std::sync::Arc<crate::compute::cpu::pool::Pool>> {
        match self {
            Exec::Cpu(c) => c.pool(),
            Exec::Vulkan(_) => None,
        }
    }

    /// The CPU engine's kernel set; `None` on a GPU.
    pub fn cpu_kernels(&self) -> Option<crate::compute::cpu::kernels::KernelSet> {
        match self {
            Exec::Cpu(c) => Some(c.kernels()),
            Exec::Vulkan(_) => None,
        }
    }

    pub fn is_vulkan(&self) -> bool {
        matches!(self, Exec::Vulkan(_))
    }

    /// What the Vulkan loader and driver added to the process's resident memory as they
    /// loaded ([`vulkan::Engine::driver_bytes`]); `None` on the CPU engine.
    pub fn driver_bytes(&self) -> Option<u64> {
        match self {
            Exec::Cpu(_) => None,
            Exec::Vulkan(v) => v.engine().driver_bytes(),
        }
    }

    /// `plan` with the Vulkan driver's measured resident memory as a line of its own, where
    /// the engine is Vulkan.
    pub fn with_driver(&self, mut plan: MemoryPlan) -> MemoryPlan {
        if let Some(bytes) = self.driver_bytes() {
            plan.add(
                "vulkan driver: code and data (measured as it loaded)",
                1,
                bytes,
            );
        }
        plan
    }

    /// The Vulkan device's type; `None` on the CPU engine.
    pub fn vulkan_device_type(&self) -> Option<vulkan::DeviceType> {
        match self {
            Exec::Cpu(_) => None,
            Exec::Vulkan(v) => Some(v.engine().info().device_type),
        }
    }

    /// Sizes the GPU frame pass's buffers (see [`VulkanExec::reserve_frames`]); the CPU engine
    /// has none, and refuses.
    pub fn reserve_frames(
        &mut self,
        target: TensorId,
        frame_bytes: usize,
        window_words: usize,
    ) -> Result<()> {
        match self {
            Exec::Cpu(_) => Err(Error::Model(NO_GPU_FRAMES.into())),
            Exec::Vulkan(v) => Ok(v.reserve_frames(target, frame_bytes, window_words)?),
        }
    }

    /// Bytes of the GPU frame pass's buffers (0 on the CPU engine and before first use).
    pub fn frame_bytes(&self) -> u64 {
        match self {
            Exec::Cpu(_) => 0,
            Exec::Vulkan(v) => v.frame_bytes(),
        }
    }

    /// Runs the frame pass on the GPU, then entry `then` in the same submission (see
    /// [`VulkanExec::run_frame`]); the CPU engine refuses.
    pub fn run_frame(
        &mut self,
        job: &vulkan::FrameJob<'_>,
        then: Option<usize>,
    ) -> Result<vulkan::FrameTiming> {
        match self {
            Exec::Cpu(_) => Err(Error::Model(NO_GPU_FRAMES.into())),
            Exec::Vulkan(v) => Ok(v.run_frame(job, then)?),
        }
    }

    pub fn run(&mut self, entry: usize) -> Result<RunTiming> {
        match self {
            Exec::Cpu(c) => c.run(entry).map(RunTiming::from).map_err(Error::from),
            Exec::Vulkan(v) => v.run(entry).map(RunTiming::from).map_err(Error::from),
        }
    }

    /// Runs entry `entry` reading `input` as the start of byte tensor `id`: a batch where the
    /// loader put it. On Vulkan, bytes in an imported ring slot are copied by the GPU in the
    /// step's own submission (one submission, one fence); the CPU engine reads them in place
    /// when they fill the tensor. Either way the result is that of [`Exec::write_bytes`] then
    /// [`Exec::run`], except that afterwards the tensor may not hold `input`.
    pub fn run_reading(
        &mut self,
        entry: usize,
        id: TensorId,
        input: SlotBytes<'_>,
    ) -> Result<RunTiming> {
        match self {
            Exec::Cpu(c) => c
                .run_reading(entry, id, input.bytes())
                .map(RunTiming::from)
                .map_err(Error::from),
            Exec::Vulkan(v) => v
                .run_reading(entry, id, input)
                .map(RunTiming::from)
                .map_err(Error::from),
        }
    }

    /// Command-buffer submissions so far (each waited for with one fence); 0 on the CPU.
    pub fn submissions(&self) -> u64 {
        match self {
            Exec::Cpu(_) => 0,
            Exec::Vulkan(v) => v.engine().submissions(),
        }
    }

    /// Labels for [`RunTiming::per_kernel`] of entry `entry`.
    pub fn kernel_names(&self, entry: usize) -> Vec<String> {
        match self {
            Exec::Cpu(c) => c.kernel_names(entry),
            Exec::Vulkan(v) => v
                .kernels(entry)
                .iter()
                .map(|(k, _)| (*k).to_owned())
                .collect(),
        }
    }

    pub fn write_f32(&mut self, id: TensorId, data: &[f32]) -> Result<()> {
        match self {
            Exec::Cpu(c) => Ok(c.write_f32(id, data)?),
            Exec::Vulkan(v) => Ok(v.write_f32(id, data)?),
        }
    }

    pub fn read_f32(&mut self, id: TensorId, out: &mut [f32]) -> Result<()> {
        match self {
            Exec::Cpu(c) => Ok(c.read_f32(id, out)?),
            Exec::Vulkan(v) => Ok(v.read_f32(id, out)?),
        }
    }

    pub fn write_bytes(&mut self, id: TensorId, data: &[u8]) -> Result<()> {
        match self {
            Exec::Cpu(c) => Ok(c.write_bytes(id, data)?),
            Exec::Vulkan(v) => Ok(v.write_bytes(id, data)?),
        }
    }

    pub fn read_bytes(&mut self, id: TensorId, out: &mut [u8]) -> Result<()> {
        match self {
            Exec::Cpu(c) => Ok(c.read_bytes(id, out)?),
            Exec::Vulkan(v) => Ok(v.read_bytes(id, out)?),
        }
    }
}
