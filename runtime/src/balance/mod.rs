//! Measuring the balance equation `T_g · B / C ≤ T_step`: per-stage counters that are cheap
//! enough to stay on (a few relaxed atomic adds per unit of loader work, none per byte).

mod counters;
mod equation;
mod simulate;
pub mod timeline;

pub use counters::{
    coefficient_of_variation, PipelineCounters, PipelineSnapshot, StageCounters, StageSnapshot,
};
pub use equation::{
    evaluate, parse_duration, BalanceError, BalanceInput, BalanceReport, Binding, WhatIf,
};
pub use simulate::{
    closed_form, constant_forecast, constant_schedule, simulate, ConstantForecast, DistKind,
    DistSpec, Distribution, Method, Policy, Regime, Role, SimConfig, SimError, SimReport,
    Simulation,
};
pub use timeline::Timeline;
