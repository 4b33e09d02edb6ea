//! The benchmarks behind `fulcrum bench` and `fulcrum-bench`, at the top of the library: they
//! drive the layers below as a user would (pack a set, train, serve), and nothing below
//! imports them. Figures are ratios to a baseline measured in the same run; the measurement
//! journals are in docs/perf/.
//!
//! - [`io`]: the input pipeline against the raw read limit (`bench io`).
//! - [`compute`]: the forward pass and training step per engine and kernel (`bench compute`).
//! - [`balance`]: training starved against `--autotune` with slowed loaders (`bench balance`).
//! - [`serve`]: `fulcrumd` under load from clients, idle, fine-tuning and reloading
//!   (`bench serve`).

pub mod balance;
pub mod compute;
pub mod io;
pub mod serve;

pub use io::{
    bench_io, default_bench_data, default_bench_data_sized, ensure_bench_data,
    ensure_bench_data_sized, IoBenchConfig, IoBenchReport, Throughput,
};
