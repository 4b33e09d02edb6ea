//! The CPU engine's kernels: the Rust twin of every GPU kernel, and a first-class engine of its
//! own (on a Raspberry Pi the CPU runs det-s faster than the V3D GPU).
//!
//! Each kernel takes its op description from [`crate::compute::ops`] as the first argument and
//! plain slices for its tensors; working memory comes from a [`Scratch`] sized at set-up, so a
//! training step allocates nothing.

pub mod add;
pub(crate) mod arena;
mod band_copies;
mod banded;
pub mod conv;
pub mod copy;
pub mod decode;
pub mod depthwise;
mod dw3x3;
pub mod exec;
mod fusion;
mod gemm;
#[cfg(test)]
pub(crate) mod gradcheck;
mod image_major;
pub mod kernels;
pub mod loss;
pub mod normalize;
pub mod optim;
pub mod pool;
pub mod reduce;
mod schedule;
pub mod scratch;
mod separable;
mod stem;
pub mod targets;
pub mod upsample;
mod upsampled;

pub use conv::{
    conv2d_backward, conv2d_backward_scratch_len, conv2d_forward, conv2d_forward_scratch_len,
    conv2d_forward_split, splits_by_channels,
};
pub use scratch::Scratch;
