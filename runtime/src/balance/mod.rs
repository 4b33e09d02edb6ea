//! Measuring the balance equation `T_g · B / C ≤ T_step`: per-stage counters that are cheap
//! enough to stay on (a few relaxed atomic adds per unit of loader work, none per byte).

mod bench_io;
mod budget;
mod counters;
mod equation;
mod simulate;
pub mod timeline;

pub use bench_io::{
    bench_io, default_bench_data, default_bench_data_sized, ensure_bench_data,
    ensure_bench_data_sized, IoBenchConfig, IoBenchReport, Throughput,
};
pub use budget::{
    human, largest_fitting, parse_size, peak_resident, process_memory_limit, resident,
    resident_files, MemoryPlan, PlanItem, ProcessLimit,
};

pub use counters::{
    coefficient_of_variation, thread_cpu_time, PipelineCounters, PipelineSnapshot, StageCounters,
    StageSnapshot,
};
pub use equation::{evaluate, parse_duration, BalanceInput, BalanceReport, Binding, WhatIf};
pub use simulate::{
    closed_form, constant_forecast, constant_schedule, simulate, ConstantForecast, DistKind,
    DistSpec, Distribution, Method, Policy, Regime, Role, SimConfig, SimError, SimReport,
    Simulation,
};
pub use timeline::Timeline;
