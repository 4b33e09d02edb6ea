//! The AVX-512 set (x86-64 CPUs with AVX-512F: Intel since Skylake-SP, AMD since Zen 4).
//!
//! Its own kernels are the ones where 16 lanes and 32 registers pay: the GEMM's register
//! tiles (8 rows × 16 columns, one accumulator a row, the A element broadcast from memory
//! inside the FMA, ragged edges under a lane mask) and the dot kernel of the weight
//! gradients. The 3×3 depthwise plane kernels and the byte-to-float row are the AVX2 set's:
//! det-s's planes are 8 to 64 columns wide, where 16 lanes would mostly run masked. Every
//! CPU with AVX-512F has AVX2 and FMA (checked with it), so calling them is sound.

mod gemm;

use super::avx2;
use super::{KernelSet, Kernels};

static KERNELS: Kernels = Kernels {
    set: KernelSet::Avx512,
    gemm_fused: Some(gemm::fused),
    gemm_accumulate: gemm::accumulate,
    dw3x3_conv: avx2::dw3x3::conv,
    dw3x3_same: Some(avx2::dw3x3::same),
    dw3x3_half: Some(avx2::dw3x3::half),
    dense3x3_half: Some(gemm::dense3x3_half),
    dw3x3_weight_grad: avx2::dw3x3::weight_grad,
    dw3x3_input_grad_s2: avx2::dw3x3::input_grad_s2,
    rgb_row: avx2::elementwise::rgb_row,
};

/// The set, where the CPU has AVX-512F and also AVX2 and FMA (the kernels it shares with
/// that set).
pub(super) fn kernels() -> Option<&'static Kernels> {
    let here = std::arch::is_x86_feature_detected!("avx512f") && avx2::kernels().is_some();
    here.then_some(&KERNELS)
}
