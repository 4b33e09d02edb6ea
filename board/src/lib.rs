//! `fulcrum-board`: what fulcrum knows about the boards it runs on, and the wire protocol to the
//! robot's firmware. Always `no_std` and allocation-free, so the firmware can share the
//! protocol types; the Linux runtime enables `std` for detection.
//!
//! - [`profile`]: board profiles (cores and their big/little layout, memory, storage, GPU) and
//!   where to pin loader threads ([`BoardProfile::loader_cores`]).
//! - [`detect`](mod@detect): which board this is, from the device-tree model and `/proc/cpuinfo`.
//! - [`protocol`]: the versioned messages between `fulcrumd` and the firmware (frames in,
//!   detections out, control), fixed little-endian layouts with a schema hash.
//!
//! Features (additive, embassy style):
//! - `std` (default): `detect()` and `host_cores()`, which read the running system.
//! - `log` (default): log through the `log` crate.
//! - `defmt`: log through `defmt` and derive `defmt::Format` on the public types, for
//!   firmware. Exclusive with `log`. With neither, logging compiles to nothing.
#![no_std]
#![forbid(unsafe_code)]

#[cfg(feature = "std")]
extern crate std;

// First, so the logging macros are visible in every module below.
#[macro_use]
mod fmt;

pub mod detect;
pub mod profile;
pub mod protocol;

pub use detect::detect_from;
#[cfg(feature = "std")]
pub use detect::{detect, host_cores};
pub use profile::{BoardId, BoardProfile, CoreSet, GpuExpectation, StorageKind};
pub use protocol::{Detection, Message, WireError};
