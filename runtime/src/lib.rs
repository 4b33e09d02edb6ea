//! fulcrum: training and inference runtime for a small object detector on single-board computers.
//!
//! Data flows through the modules top to bottom: `format` (bytes on disk) → `pack` (datasets into
//! shards) → `io` (reads) → `ring` (fixed prefetch slots) → `loader` (threads that fill them),
//! with `balance` counting what every stage costs.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod balance;
pub mod base;
pub mod bench;
pub mod compute;
pub mod durable;
pub mod format;
#[doc(hidden)]
pub mod fuzzing;
pub mod infer;
pub mod io;
pub mod loader;
pub mod model;
pub mod pack;
pub mod pixels;
pub mod ring;
pub mod serve;
pub mod text;
pub mod trace;
pub mod train;
