//! The detector: its architecture ([`arch`]), its step as a recording with the backward pass
//! derived from the forward one ([`graph`]) and its initial weights ([`init`]).

pub mod arch;
pub mod builtin_base;
pub mod checkpoint;
pub mod graph;
pub mod init;
pub mod onnx;

pub use arch::{Arch, ConfigError, ModelConfig};
pub use checkpoint::{Checkpoint, Progress};
pub use graph::{
    Freeze, GraphError, GraphOptions, ModelGraph, ENTRY_EVAL, ENTRY_INFER, ENTRY_TRAIN,
};
