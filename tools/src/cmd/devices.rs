use std::process::ExitCode;

use fulcrum::compute::cpu::kernels::{self, KernelSet};
use fulcrum::compute::vulkan::{self, Options};

/// List the compute devices: every Vulkan device (with what fulcrum would pick) and the CPU.
///
/// A machine with no Vulkan loader or no driver is not an error: the CPU engine is listed
/// and the reason Vulkan is missing is said.
#[derive(clap::Args)]
pub struct Args {
    /// Print the list as JSON instead.
    #[arg(long)]
    json: bool,
    /// Show queue families, memory heaps and limits too.
    #[arg(long, short)]
    verbose: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let options = Options::default();
    let listed = vulkan::list_devices(&options);
    let cpu_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kernels = kernels::chosen();
    let kernels_json = serde_json::json!({
        "chosen": kernels.as_ref().ok(),
        "error": kernels.as_ref().err().map(|e| e.to_string()),
        "available": KernelSet::here(),
    });
    if a.json {
        let value = match &listed {
            Ok(list) => serde_json::json!({
                "vulkan": list,
                "picked": vulkan::pick_device(&list.devices, None).ok(),
                "cpu_threads": cpu_threads,
                "cpu_kernels": kernels_json,
            }),
            Err(e) => serde_json::json!({
                "vulkan": null,
                "vulkan_error": e.to_string(),
                "cpu_threads": cpu_threads,
                "cpu_kernels": kernels_json,
            }),
        };
        crate::outln!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::SUCCESS);
    }
    match &listed {
        Ok(list) => {
            let picked = vulkan::pick_device(&list.devices, None).ok();
            crate::outln!("Vulkan (loader {}):", list.loader_version);
            if list.devices.is_empty() {
                crate::outln!("  no devices");
            }
            for d in &list.devices {
                let mark = if Some(d.index) == picked { "*" } else { " " };
                crate::outln!(
                    "{mark} {}  {}  Vulkan {}, {}",
                    d.index,
                    d.label(),
                    d.api_version,
                    d.driver_summary()
                );
                let memory = match (d.unified_memory, d.host_import_alignment.is_some()) {
                    (true, true) => "unified memory, ring slots imported (no CPU copy)",
                    (false, true) => "separate memory, ring slots imported (no CPU copy)",
                    (true, false) => "unified memory, batches copied in by the CPU",
                    (false, false) => "separate memory, batches copied in by the CPU",
                };
                crate::outln!(
                    "     {} MiB device-local, {memory}, timestamps: {}, fp16: {}",
                    d.device_local_bytes() >> 20,
                    if d.limits.timestamp_valid_bits > 0 {
                        "yes"
                    } else {
                        "no"
                    },
                    if d.shader_float16 { "yes" } else { "no" },
                );
                if let Some(reason) = &d.unusable {
                    crate::outln!("     not usable: {reason}");
                }
                if a.verbose {
                    for q in &d.queue_families {
                        crate::outln!(
                            "     queue family {}: {} queue(s){}{}{}, timestamp bits {}",
                            q.index,
                            q.queues,
                            if q.graphics { " graphics" } else { "" },
                            if q.compute { " compute" } else { "" },
                            if q.transfer { " transfer" } else { "" },
                            q.timestamp_valid_bits
                        );
                    }
                    for h in &d.memory_heaps {
                        crate::outln!(
                            "     memory heap {}: {} MiB{}{}",
                            h.index,
                            h.bytes >> 20,
                            if h.device_local { " device-local" } else { "" },
                            if h.host_visible { " host-visible" } else { "" }
                        );
                    }
                    let l = &d.limits;
                    crate::outln!(
                        "     limits: {} invocations/workgroup, {} KiB shared, {} B push constants, subgroup {}",
                        l.max_compute_work_group_invocations,
                        l.max_compute_shared_memory_size / 1024,
                        l.max_push_constants_size,
                        d.subgroup_size.map_or("?".to_owned(), |s| s.to_string())
                            + if d.subgroup_arithmetic {
                                " (arithmetic: subgroup sums)"
                            } else {
                                ""
                            }
                    );
                }
            }
            if picked.is_some() {
                crate::outln!("  (* = the device --engine vulkan uses; --device N picks another)");
            }
        }
        Err(e) => {
            crate::outln!("Vulkan: unavailable: {e}");
        }
    }
    crate::outln!("CPU: {cpu_threads} thread(s) (--engine cpu)");
    let here = kernels::names(&KernelSet::here());
    match kernels {
        Ok(set) => crate::outln!(
            "     kernels: {set} ({}); this CPU runs: {here} ({} forces one)",
            set.describe(),
            kernels::ENV
        ),
        Err(e) => crate::outln!("     kernels: {e}"),
    }
    Ok(ExitCode::SUCCESS)
}
