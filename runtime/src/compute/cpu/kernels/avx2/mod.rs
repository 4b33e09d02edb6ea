//! The AVX2 + FMA set (x86-64 CPUs since Haswell and Zen).

// The AVX-512 set shares some of these kernels.
pub(super) mod dw3x3;
pub(super) mod elementwise;
mod frame;
pub(super) mod gemm;

use super::{KernelSet, Kernels};

static KERNELS: Kernels = Kernels {
    set: KernelSet::Avx2,
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
    gather_taps: Some(frame::gather_taps),
};

/// The set, where the CPU has AVX2 and FMA (everything its kernels are compiled with).
pub(super) fn kernels() -> Option<&'static Kernels> {
    let here =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    here.then_some(&KERNELS)
}
