//! The NEON set (aarch64, where Advanced SIMD is part of the baseline: every board fulcrum
//! targets has it, so the set needs no detection).

mod dw3x3;
mod elementwise;
mod frame;
mod gemm;

use super::{KernelSet, Kernels};

pub(super) static KERNELS: Kernels = Kernels {
    set: KernelSet::Neon,
    gemm_fused: Some(gemm::fused),
    gemm_accumulate: gemm::accumulate,
    dw3x3_conv: dw3x3::conv,
    dw3x3_same: Some(dw3x3::same),
    dw3x3_half: Some(dw3x3::half),
    dense3x3_half: Some(gemm::dense3x3_half),
    dw3x3_weight_grad: dw3x3::weight_grad,
    dw3x3_input_grad_s2: dw3x3::input_grad_s2,
    rgb_row: elementwise::rgb_row,
    weighted_rows: frame::weighted_rows,
    gather_taps: None,
};
