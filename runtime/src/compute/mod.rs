//! Compute: the detector's kernels, described once ([`ops`]), and the work of a step as data
//! ([`recording`]), run by two engines — the CPU engine's Rust kernels ([`cpu`], also the
//! reference every GPU kernel is tested against) and Vulkan compute shaders ([`vulkan`]).

pub mod ab;
pub mod cpu;
pub mod exec;
pub mod fusion;
pub mod ops;
pub mod recording;
pub(crate) mod steps;
pub mod storage;
pub mod vulkan;

pub use recording::{Elem, Recording, Role, Step, TensorId};
